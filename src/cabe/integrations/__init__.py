"""cabe inside other tools: :mod:`cabe.integrations.transformers` has ``CabeCallback`` for the
Hugging Face ``Trainer`` (and TRL's trainers, which are Trainers)."""
