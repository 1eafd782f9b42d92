"""The Gateway layer: the `ninfer` command line (`cli/`) and the OpenAI-compatible HTTP server
(`http/`). Both reach the model only through the public `ninfer.Engine` and its types."""
