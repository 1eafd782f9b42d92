"""The Engine. Package-neutral: it talks to a Program and a Frontend only through `ninfer.contract`.

  facade.py              the public Engine: builds the model's Frontend and Program, starts the worker
  engine_core.py         the worker loop and its boundary order (start here)
  intake.py              submit and validation; the only state caller threads share with the worker
  handle.py              what a caller holds: GenerationHandle, its ticket and response channel
  scheduler.py           FIFO queue, staged-prefill gate, fairness, decode-round membership
  admission_policy.py    outstanding capacity; when admission is tried again
  admission.py           one admission attempt (plan, materialize, activate, backfill)
  resource_manager.py    lanes and resource transitions; materialization_planner.py, context_cache.py,
                         session_index.py: prefix reuse across requests
  unit_executor.py       one model execution unit and the commit of its PendingBatch
  model_transaction.py   the accepted-prefix decision of each row (pure)
  terminal.py            how execution ends and a lane is given back
  publication.py         the outstanding records and every event sent to a consumer
  request_record.py      the worker's record of a request and its token vocabulary
  causal_score_core.py   the Engine of the CausalScoring purpose
  metrics.py             counters, histograms and gauges behind `Engine.metrics()`
"""
