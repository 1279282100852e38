"""The HTTP server: OpenAI- and Anthropic-compatible endpoints over an ``AsyncLLMEngine``."""

from atlas_core.server.app import create_app
from atlas_core.server.config import ServerConfig
from atlas_core.server.errors import APIError

__all__ = ["APIError", "ServerConfig", "create_app"]
