"""`specdec distill`: make a draft model that imitates the target (sequence-level knowledge distillation).

Three stages, each a library function with progress callbacks (the CLI in cli/distill_cmd.py and
cli/distill_stages.py renders them), for two kinds of draft, a student and an EAGLE head (eagle_train.py,
eagle_evaluate.py):

- generate.py: the target answers prompts through the speculative engine; one JSONL row per answer
  (prompt, answer text and ids, prompt ids, target name and tokenizer fingerprint), appended and fsynced
  row by row, so an interrupted run resumes where it stopped. The file is also a `build-index` corpus.
- train.py: a student with the target's tokenizer (by default the target's embeddings, first N blocks,
  final norm and head) learns the target's answers (next-token loss) plus an optional divergence to the
  target's own distributions; AdamW, warm-up + cosine, clipping, accumulation, safetensors checkpoints,
  resume, in the training loop it shares with an EAGLE head (loop.py). The result is a Hugging Face model
  directory that `--drafter model --draft-model DIR` loads.
- evaluate.py: before and after training, on held-out prompts: top-1 agreement with the target along the
  target's own answers and the mean accepted tokens of a real speculative run.

Nothing here imports Typer or Rich; torch is imported inside functions.
"""

from __future__ import annotations

from .generate import DataRow, GenerateSummary, generate_data, read_rows
from .train import TrainConfig, TrainProgress, TrainResult, train_draft

__all__ = [
    "DataRow",
    "GenerateSummary",
    "TrainConfig",
    "TrainProgress",
    "TrainResult",
    "generate_data",
    "read_rows",
    "train_draft",
]
