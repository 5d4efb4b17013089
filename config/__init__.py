"""Warren's one configuration model: a TOML file plus WARREN_* environment."""
from config.settings import ConfigError, Settings, User, load_settings

__all__ = ["ConfigError", "Settings", "User", "load_settings"]
