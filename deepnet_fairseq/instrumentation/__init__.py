"""Training-stability instrumentation that fairseq loads: sublayer naming and the hook-based monitors."""
