"""A lerobot robot with fake cameras and motors, logging what it shows and what it executes."""
from .config_vlac_fake import VlacFakeConfig
from .vlac_fake import VlacFake

__all__ = ["VlacFakeConfig", "VlacFake"]
