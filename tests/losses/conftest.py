"""Liger-Kernel's Triton kernels run through Triton's CPU interpreter when no GPU is present (set up as for the
kernel tests, before Liger is first imported: `wide.losses` imports it lazily)."""

import tests.kernels.conftest  # noqa: F401
