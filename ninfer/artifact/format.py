"""`.ninfer` framing: fixed header, dtype names, alignment, the one error class.

File layout (all integers little-endian; see docs/artifact.md):

    offset 0        header (HEADER_STRUCT, 72 bytes), zero padded to DATA_START
    DATA_START      payloads: tensors then resource blobs, each at a multiple of ALIGNMENT
    descriptor_off  descriptor: UTF-8 JSON, descriptor_nbytes long, ends the file

The header carries the descriptor's position, the total file size and the SHA-256 of the
descriptor bytes, so a reader can reject a truncated or damaged file before trusting any offset.
The descriptor is written last because payload checksums are known only after streaming.
"""
from __future__ import annotations

import struct

import torch

MAGIC = b"\x89NINFER\n"
FORMAT_VERSION = 1
# magic, format version, flags (0), descriptor offset, descriptor nbytes, file size, sha256(descriptor)
HEADER_STRUCT = struct.Struct("<8sIIQQQ32s")
ALIGNMENT = 4096
DATA_START = ALIGNMENT
CHECKSUM = "sha256"

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
STORAGE_DTYPES = ("bf16", "fp32")

# Keys of `Artifact.frontend_resources()`; the first three are required in every artifact.
RESOURCE_NAMES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                  "preprocessor_config.json", "video_preprocessor_config.json")
REQUIRED_RESOURCES = RESOURCE_NAMES[:3]


class ArtifactError(Exception):
    """A `.ninfer` file could not be written or read; the message names the problem."""


def align_up(n: int, a: int = ALIGNMENT) -> int:
    return (n + a - 1) // a * a


def pack_header(descriptor_offset: int, descriptor_nbytes: int, file_size: int, digest: bytes) -> bytes:
    return HEADER_STRUCT.pack(MAGIC, FORMAT_VERSION, 0, descriptor_offset, descriptor_nbytes, file_size, digest)


def element_size(dtype_name: str) -> int:
    return torch.empty((), dtype=DTYPES[dtype_name]).element_size()
