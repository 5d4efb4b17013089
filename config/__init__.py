"""Warren's one configuration model: a TOML file plus WARREN_* environment."""
from warren.config.settings import ClusterNode, ConfigError, Settings, User, load_settings

__all__ = ["ClusterNode", "ConfigError", "Settings", "User", "load_settings"]
