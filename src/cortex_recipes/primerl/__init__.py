"""Adapters that let prime-rl's own orchestrator and env-server drive Cortex Training.

``inference``: the HTTP server prime-rl uses as its vLLM server, backed by a sampling sub-job.
``trainer``: the process that reads prime-rl's rollout files and trains the training sub-job.
``broadcasts``: the weight-version files the two share with the orchestrator.
``rollout_files``: decoding prime-rl's ``rank_<r>.bin`` micro-batch files.
"""
