"""The package-neutral contracts between the layers.

frontend.py   what the Engine carries for a Frontend: PreparedPrompt, OutputOptions, Preview, FinishReason
program.py    the Engine <-> Program interface: SequenceRequest, ResourcePlan/Result, PendingBatch, Program
scoring.py    the CausalScoring window interface
"""
