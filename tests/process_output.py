"""Reading the output file a child process is still writing."""

import os


def read_output(file) -> str:
    """All of `file` so far, read at explicit offsets: the child shares this file's offset (the
    same open file, dup'ed to its stdout and stderr), so a seek here would move where it writes
    next and its line would overwrite the start of the file."""
    chunks, offset = [], 0
    while chunk := os.pread(file.fileno(), 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks).decode(errors="replace")
