"""pytest-specdecode: would speculative decoding make this vLLM deployment faster?"""

__version__ = "0.1.0"
