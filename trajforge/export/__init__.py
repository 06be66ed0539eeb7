"""What a merge publishes beside trajectories.jsonl: exports for trainers (export/), the dataset card
(README.md) and the report (report.html). The entry point is trajforge.export.publish."""

FORMATS = ("openai", "llamafactory", "atif", "parquet")
