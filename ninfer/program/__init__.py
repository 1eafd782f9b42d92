"""The physical machinery every Program uses, independent of the model family: the KV page pool,
the StateImage slot pool, block tables, device stores, the resource ledger and pending transactions."""
