"""What a merge publishes beside trajectories.jsonl: exports for trainers (export/), the dataset card
(README.md) and the report (report.html). The entry point is trajforge.export.publish; the formats are
the registry's (trajforge/registry.py: the built-ins of export/formats.py and any plugin's)."""
