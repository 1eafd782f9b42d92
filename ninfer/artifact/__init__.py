"""`.ninfer` artifacts: the one model file the runtime loads (format: docs/artifact.md)."""
from ninfer.artifact.format import ALIGNMENT, FORMAT_VERSION, MAGIC, RESOURCE_NAMES, ArtifactError
from ninfer.artifact.reader import Artifact, open_artifact
from ninfer.artifact.writer import ChunkedTensor, write_artifact

__all__ = ["ALIGNMENT", "FORMAT_VERSION", "MAGIC", "RESOURCE_NAMES", "Artifact", "ArtifactError", "ChunkedTensor",
           "open_artifact", "write_artifact"]
