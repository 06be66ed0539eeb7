"""What a merge publishes beside trajectories.jsonl: exports for trainers (export/), the dataset card
(README.md) and the report (report.html). The entry point is trajforge.export.publish."""

FORMATS = ("openai", "llamafactory", "atif", "parquet", "rl")
# format -> its file in export/; here, so that nobody imports pyarrow (a second) to learn a file name
FILES = {
    "openai": "openai.jsonl",
    "llamafactory": "llamafactory.json",
    "atif": "atif.jsonl",
    "parquet": "trajectories.parquet",
    "rl": "rl.jsonl",  # and rl.parquet beside it when parquet is asked too (export/rl.py)
}
