import json
from pathlib import Path

expected = sum(int(line) for line in Path("/app/numbers.txt").read_text().split())
try:
    written = Path("/app/sum.txt").read_text()
except OSError:
    written = ""
exists = 1.0 if written else 0.0
correct = 1.0 if written.strip() == str(expected) else 0.0
print(f"expected {expected}, found {written.strip()!r}")
Path("/logs/verifier/reward.json").write_text(json.dumps({"reward": correct, "exists": exists}))
