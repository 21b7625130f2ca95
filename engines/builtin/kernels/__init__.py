"""Triton kernels of the builtin engine: KV store, paged decode and prefill attention,
shared-prefix attention and the log-sum-exp merge. Each module holds one kernel and the
wrapper that checks its inputs before launching it.

On a machine without a GPU the kernels run under ``TRITON_INTERPRET=1`` (slowly; for
correctness tests on small shapes).
"""
