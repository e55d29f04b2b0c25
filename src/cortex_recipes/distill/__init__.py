"""On-policy distillation: teacher scoring on exact sampled ids, alignment, fail-closed checks."""
