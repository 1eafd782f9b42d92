"""The Engine: the public facade (`facade.Engine`), the worker core, the Scheduler, the
ResourceManager and context cache, request records, model transactions, causal scoring and metrics.
Package-neutral: it talks to a Program and a Frontend only through `ninfer.contract`."""
