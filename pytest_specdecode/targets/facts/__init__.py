"""What is known of the engine and the host before a start.

- vllm.py: the target's own vLLM (its version, methods, config keys); cache.py remembers it;
- gpu.py: the GPUs, judged by the unit's own processes (nvidia-smi).
"""
