"""Warren's one configuration model: a TOML file plus WARREN_* environment."""
from warren.config.settings import WAL_MAX_SIZE_BYTES_MIN, ClusterNode, ConfigError, Settings, User, load_settings

__all__ = ["WAL_MAX_SIZE_BYTES_MIN", "ClusterNode", "ConfigError", "Settings", "User", "load_settings"]
