from .base_generator import BaseGenerator, query_single_turn

__all__ = [
    "BaseGenerator",
    "query_single_turn",
]
