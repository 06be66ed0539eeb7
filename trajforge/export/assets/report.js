"use strict";
// The run report. Every string of the data is model- or web-written: it reaches the page only as
// text nodes (el() and textContent), never as HTML.
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const stats = data.statistics || {};
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key === "onclick") node.addEventListener("click", value);
      else node.setAttribute(key, value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  const number = (value) => (typeof value === "number" ? value.toLocaleString("en-US") : "–");
  const percent = (value) => (typeof value === "number" ? (value * 100).toFixed(1) + "%" : "–");
  const seconds = (value) => (typeof value === "number" ? value.toFixed(1) + " s" : "–");

  // -- the run at a glance -------------------------------------------------------------------
  function overview() {
    const usage = stats.usage || {};
    const reasoning = stats.reasoning_statistics || {};
    document.getElementById("run-meta").textContent =
      `model ${stats.model || "?"} · dataset ${stats.dataset_file || "?"} · distribution ${stats.distribution || "?"}` +
      ` · report written ${data.generated_at}`;
    const cost = typeof usage.cost === "number" ? "$" + usage.cost.toFixed(4) : "unknown";
    const cards = [
      ["total_prompts", "dataset entries", number(stats.total_prompts)],
      ["trajectories", "trajectories kept", number(stats.trajectories)],
      ["completed", "completed", number(stats.completed)],
      ["partial", "partial", number(stats.partial)],
      ["discarded_no_reasoning", "discarded: no reasoning", number(stats.discarded_no_reasoning)],
      ["discarded_hallucinated_tools", "discarded: hallucinated tool", number(stats.discarded_hallucinated_tools)],
      ["failed", "failed prompts", number(stats.failed)],
      ["total_tokens", "tokens", number(usage.total_tokens)],
      ["cost", "cost", cost],
      ["duration_seconds", "duration", seconds(stats.duration_seconds)],
      ["coverage", "reasoning coverage", percent(reasoning.coverage)],
    ];
    if (usage.judge_tokens) {  // a judge's share of the tokens and cost above (--judge, a verify judge)
      const judged = typeof usage.judge_cost === "number" ? "$" + usage.judge_cost.toFixed(4) : "unknown";
      cards.push(["judge_cost", `judge: ${number(usage.judge_tokens)} tokens`, judged]);
    }
    const verification = data.summary.verification || {};
    const verified = (verification.passed || 0) + (verification.failed || 0);
    if (verified) cards.push(["pass_rate", "pass rate", percent((verification.passed || 0) / verified)]);
    const box = document.getElementById("cards");
    for (const [key, label, value] of cards) {
      box.append(el("div", { class: "card" }, el("div", { class: "value", dataset: { stat: key } }, value),
        el("div", { class: "label" }, label)));
    }
    const tables = document.getElementById("breakdown");
    tables.append(table("Failed prompts by error type", stats.errors || {}));
    tables.append(table("Finished samples by exit reason", data.summary.exit_reasons || {}));
    tables.append(table("Tokens", {
      prompt: usage.prompt_tokens, completion: usage.completion_tokens, reasoning: usage.reasoning_tokens,
      cached: usage.cached_tokens, total: usage.total_tokens,
    }));
    if (verified) tables.append(table("Verification", verification));
  }

  function table(caption, counts) {
    const rows = Object.entries(counts).filter(([, value]) => value !== undefined && value !== null);
    return el("table", {}, el("caption", {}, caption),
      rows.length ? rows.map(([key, value]) => el("tr", {}, el("th", {}, key || "(none)"),
        el("td", { class: "num" }, number(value)))) : el("tr", {}, el("td", {}, "none")));
  }

  // -- charts: small SVGs drawn here, no library ---------------------------------------------------
  function chartBox(title, node) {
    document.getElementById("chart-grid").append(el("div", { class: "chart" }, el("h3", {}, title), node));
  }

  function toolChart(rows) {
    const width = 420, rowHeight = 18, labelWidth = 150, height = rows.length * rowHeight + 4;
    const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
    const top = Math.max(1, ...rows.map((row) => row[1]));
    rows.forEach(([name, calls, failures], i) => {
      const y = i * rowHeight + 2, full = ((width - labelWidth - 90) * calls) / top;
      root.append(svg("text", { x: 0, y: y + 12 }, name));
      root.append(svg("rect", { class: "bar", x: labelWidth, y, width: Math.max(full, 1), height: rowHeight - 5 }));
      if (failures) {
        root.append(svg("rect", { class: "bar-bad", x: labelWidth, y, width: Math.max((full * failures) / calls, 1),
          height: rowHeight - 5 }));
      }
      const rate = calls ? ((100 * failures) / calls).toFixed(0) : "0";
      root.append(svg("text", { x: labelWidth + full + 4, y: y + 12 }, `${calls} (${rate}% failed)`));
    });
    return root;
  }

  // `ticks`: the bars' edges, one more than the bars (a histogram): marks at the edges, so the last bar ends
  // at the largest value (1 for rewards), and the last mark is drawn inside the chart rather than cut off.
  function columnChart(labels, counts, unit, ticks) {
    const width = 420, height = 160, bottom = 28, left = 34;
    const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
    const top = Math.max(1, ...counts), step = (width - left) / Math.max(counts.length, 1);
    root.append(svg("line", { class: "axis", x1: left, y1: height - bottom, x2: width, y2: height - bottom }));
    root.append(svg("text", { x: 0, y: 12 }, String(top)));
    counts.forEach((value, i) => {
      const h = ((height - bottom - 16) * value) / top, x = left + i * step;
      const bar = svg("rect", { class: "bar", x: x + 1, y: height - bottom - h, width: Math.max(step - 2, 1), height: h });
      bar.append(svg("title", {}, `${labels[i]}${unit}: ${value}`));
      root.append(bar);
    });
    const marked = ticks || labels, marks = Math.min(marked.length, 6);
    for (let k = 0; k < marks; k++) {
      const i = Math.round((k * (marked.length - 1)) / Math.max(marks - 1, 1));
      const end = ticks && i === marked.length - 1 && marked.length > 1;
      root.append(svg("text", { class: "tick", x: left + i * step, y: height - bottom + 14,
        "text-anchor": end ? "end" : "start" }, marked[i] + unit));
    }
    return root;
  }

  function histogramChart(hist, unit) {
    // Enough decimals that neighbouring bins' lower edges differ.
    const width = hist.edges.length > 1 ? hist.edges[1] - hist.edges[0] : 1;
    const decimals = width >= 1 ? 0 : Math.min(4, Math.ceil(-Math.log10(width)));
    const edges = hist.edges.map((edge) => Number(edge).toFixed(decimals));
    const labels = hist.counts.map((_, i) => `${edges[i]}–${edges[i + 1]}`);  // each bar's range, in its title
    return columnChart(labels, hist.counts, unit, edges);
  }

  function charts() {
    const c = data.charts;
    chartBox("Calls and failure rate per tool (red: failed)", c.tools.length ? toolChart(c.tools) : el("p", { class: "note" }, "No tool calls."));
    chartBox("Assistant turns per trajectory", columnChart(c.turns.map((t) => String(t[0])), c.turns.map((t) => t[1]), ""));
    chartBox("Duration per prompt", histogramChart(c.durations, " s"));
    if (c.rewards) chartBox("Reward distribution", histogramChart(c.rewards, ""));
  }

  // -- the trajectory browser ---------------------------------------------------------------------
  const items = data.trajectories.map((t) => ({
    t,
    outcome: !t.kept ? "discarded" : t.exit_reason === "completed" ? "completed" : "partial",
    verified: t.passed === true ? "passed" : t.passed === false ? "failed" : "unverified",
    text: [t.prompt, ...t.steps.flatMap((s) => [s.content, s.reasoning, ...s.calls.map((c) => c.name)])]
      .join("\n").toLowerCase(),
  }));

  const filters = [
    ["outcome", "Outcome", (item) => [item.outcome]],
    ["exit_reason", "Exit reason", (item) => [item.t.exit_reason]],
    ["discard", "Discard reason", (item) => (item.t.discard ? [item.t.discard] : [])],
    ["toolset", "Toolset", (item) => item.t.toolsets],
    ["tool", "Tool used", (item) => item.t.tools],
    ["verification", "Verification", (item) => [item.verified]],
  ];
  const chosen = {};

  function browser() {
    document.getElementById("shown-note").textContent =
      `Showing ${data.shown} of ${data.total} finished samples` +
      (data.shown < data.total ? " (discarded and failed ones first, then a deterministic sample)" : "") +
      `; texts longer than ${number(data.text_limit)} characters are cut.`;
    const form = document.getElementById("filters");
    form.addEventListener("submit", (event) => event.preventDefault());
    for (const [key, label, values] of filters) {
      const options = [...new Set(items.flatMap(values))].sort();
      const select = el("select", { name: key, id: "filter-" + key }, el("option", { value: "" }, "all"),
        options.map((value) => el("option", { value }, value || "(none)")));
      select.addEventListener("change", () => { chosen[key] = select.value; apply(); });
      form.append(el("label", {}, label, select));
    }
    const search = el("input", { type: "search", id: "filter-search", placeholder: "prompt, answer, reasoning…" });
    search.addEventListener("input", () => { chosen.search = search.value.toLowerCase(); apply(); });
    form.append(el("label", {}, "Search", search));
    const list = document.getElementById("list");
    for (const item of items) {
      const t = item.t;
      const badges = [el("span", { class: "badge " + item.outcome }, item.outcome)];
      if (t.exit_reason && t.exit_reason !== "completed") badges.push(el("span", { class: "badge" }, t.exit_reason));
      if (t.discard) badges.push(el("span", { class: "badge discarded" }, t.discard));
      if (item.verified !== "unverified") badges.push(el("span", { class: "badge " + item.verified }, item.verified));
      const label = `#${t.prompt_index}` + (t.sample_index ? `.${t.sample_index}` : "");
      item.node = el("li", {}, el("button", { type: "button", onclick: () => show(item) },
        el("span", { class: "first-line" }, label + " ", t.first_line || "(empty prompt)"),
        badges, el("span", { class: "badge" }, `${t.steps.length} turns`),
        t.tools.length ? el("span", { class: "badge" }, t.tools.join(", ")) : null));
      list.append(item.node);
    }
    apply();
  }

  function apply() {
    let shown = 0;
    for (const item of items) {
      const visible = filters.every(([key, , values]) => !chosen[key] || values(item).includes(chosen[key])) &&
        (!chosen.search || item.text.includes(chosen.search));
      item.node.hidden = !visible;
      shown += visible;
    }
    document.getElementById("match-note").textContent = `${shown} of ${items.length} shown trajectories match.`;
  }

  function show(item) {
    for (const other of items) other.node.classList.toggle("active", other === item);
    const t = item.t, usage = t.usage || {};
    const detail = document.getElementById("detail");
    const meta = [
      ["outcome", item.outcome + (t.discard ? ` (${t.discard})` : "")], ["exit reason", t.exit_reason],
      ["toolsets", t.toolsets.join(", ")], ["model calls", t.api_calls], ["duration", seconds(t.duration_seconds)],
      ["tokens", `${number(usage.prompt_tokens)} prompt, ${number(usage.completion_tokens)} completion, ` +
        `${number(usage.reasoning_tokens)} reasoning, ${number(usage.total_tokens)} total`],
      ["cost", typeof usage.cost === "number" ? "$" + usage.cost.toFixed(6) : "unknown"],
      ["finished at", t.timestamp],
    ];
    if (usage.judge_tokens) meta.push(["judge", `${number(usage.judge_tokens)} tokens, $${(usage.judge_cost || 0).toFixed(6)}`]);
    if (item.verified !== "unverified") meta.push(["verification", item.verified + (t.reward === null ? "" : `, reward ${t.reward}`)]);
    const body = [
      el("h3", {}, `Prompt #${t.prompt_index}` + (t.sample_index ? `, sample ${t.sample_index}` : "")),
      el("table", { class: "meta-table" }, meta.map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, v ?? "–")))),
      el("details", { class: "system" }, el("summary", {}, "System prompt"), el("pre", {}, t.system)),
      el("h4", {}, "Prompt"), el("pre", { class: "prompt" }, t.prompt),
    ];
    t.steps.forEach((step, i) => {
      body.push(el("h4", {}, `Turn ${i + 1}` + (step.finish_reason ? ` (${step.finish_reason})` : "")));
      body.push(step.reasoning
        ? el("details", { class: "reasoning" }, el("summary", {}, "Reasoning"), el("pre", {}, step.reasoning))
        : el("p", { class: "note" }, "No reasoning in this turn."));
      if (step.content) body.push(el("pre", { class: "content" }, step.content));
      for (const call of step.calls) {
        body.push(el("div", { class: "call-pair" },
          el("div", { class: "call" }, el("strong", {}, call.name), " ", el("span", { class: "call-id" }, call.id),
            el("pre", {}, call.arguments)),
          el("div", { class: "result" + (call.ok ? "" : " error") }, el("strong", {}, call.ok ? "result" : "error"), " ",
            el("span", { class: "call-id" }, call.id), el("pre", {}, call.answered ? call.result : "(no result recorded)"))));
      }
    });
    detail.replaceChildren(...body);
  }

  // -- failed prompts ---------------------------------------------------------------------------
  // Setup failures are the task's, not the model's (no model call was made): they are listed apart.
  function failed(id, rows, total, what, none) {
    document.getElementById(`${id}-note`).textContent = total
      ? `${total} ${what} (the last error of each` +
        (rows.length < total ? `; ${rows.length} listed` : "") +
        "); --resume runs them again, unless they are exhausted or the endpoint refused them."
      : none;
    const list = document.getElementById(`${id}-list`);
    for (const f of rows) {
      list.append(el("li", {}, el("span", { class: "first-line" }, `#${f.prompt_index} `, f.first_line || "(empty prompt)"),
        " ", el("span", { class: "badge failed" }, f.error_type), " ", el("span", { class: "badge" }, f.error_class || ""),
        ` after ${f.attempts} model call attempt(s); tried ${f.tries || 0} time(s)` +
          (f.held_back === "exhausted" ? ": exhausted, not sent again (--max_attempts)" : "") +
          (f.held_back === "endpoint" ? ": failed at the endpoint for good, not sent again (--retry_failed=endpoint)" : ""),
        el("pre", {}, f.message)));
    }
  }

  overview();
  charts();
  browser();
  failed("failed", data.failed, data.failed_total, "prompts without a trajectory failed", "No failed prompts.");
  failed("setup-failed", data.setup_failed || [], data.setup_failed_total || 0,
    "tasks failed in their setup, before any model call", "No task failed in its setup.");
})();
