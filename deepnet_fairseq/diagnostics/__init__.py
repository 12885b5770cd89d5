"""Training-stability diagnostics: sublayer naming, hook-based monitors, the depth sweep and its plots."""
