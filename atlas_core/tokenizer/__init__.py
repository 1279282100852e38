"""Tokenizer, chat-template rendering and streaming detokenisation."""

from atlas_core.tokenizer.chat_template import ChatTemplateError, render_chat_template
from atlas_core.tokenizer.detokenizer import IncrementalDetokenizer
from atlas_core.tokenizer.tokenizer import Tokenizer

__all__ = ["ChatTemplateError", "IncrementalDetokenizer", "Tokenizer", "render_chat_template"]
