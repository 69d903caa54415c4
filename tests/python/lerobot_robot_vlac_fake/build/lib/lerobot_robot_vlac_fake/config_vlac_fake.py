from dataclasses import dataclass

from lerobot.robots.config import RobotConfig


@RobotConfig.register_subclass("vlac_fake")
@dataclass(kw_only=True)
class VlacFakeConfig(RobotConfig):
    # Comma-separated names (not `cameras`: RobotConfig reads that as camera configs): cameras give uint8 (height, width, 3) frames, motors "<name>.pos".
    camera_names: str = "cam_high,cam_left_wrist,cam_right_wrist"
    height: int = 40
    width: int = 40
    motors: str = "m0,m1,m2,m3,m4,m5,m6,m7,m8"
    # The first len(motors) - actuated motors follow the commanded action; the others drift.
    actions: int = 7
    seed: int = 0
    # Where every observation shown (obs_NNNNNN.npz) and action executed (actions.jsonl) go.
    log_dir: str = ""
