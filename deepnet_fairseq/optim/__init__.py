from . import adam_foreach  # noqa: F401  (registers --optimizer adam_foreach)
