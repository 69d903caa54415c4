"""VlacFake: deterministic fake frames (a new random image per observation) and position-
controlled fake motors (a commanded position becomes the next state). Every observation it
returns and every action it executes is logged, so a test can recompute the policy's actions."""
import json
import os

import numpy as np
from lerobot.robots.robot import Robot

from .config_vlac_fake import VlacFakeConfig


class VlacFake(Robot):
    config_class = VlacFakeConfig
    name = "vlac_fake"

    def __init__(self, config: VlacFakeConfig):
        super().__init__(config)
        self.config = config
        self.cameras = [c for c in config.camera_names.split(",") if c]
        self.motors = [m for m in config.motors.split(",") if m]
        self.n_actions = config.actions
        self._connected = False
        self._rng = np.random.default_rng(config.seed)
        self._pos = self._rng.uniform(-1.0, 1.0, len(self.motors))
        self._n_obs = 0
        self._n_act = 0
        self._log = None

    @property
    def observation_features(self) -> dict:
        ft = {f"{m}.pos": float for m in self.motors}
        for c in self.cameras:
            ft[c] = (self.config.height, self.config.width, 3)
        return ft

    @property
    def action_features(self) -> dict:
        return {f"{m}.pos": float for m in self.motors[: self.n_actions]}

    @property
    def is_connected(self) -> bool:
        return self._connected

    @property
    def is_calibrated(self) -> bool:
        return True

    def connect(self, calibrate: bool = True) -> None:
        if self.config.log_dir:
            os.makedirs(self.config.log_dir, exist_ok=True)
            self._log = open(os.path.join(self.config.log_dir, "actions.jsonl"), "a", buffering=1)
        self._connected = True

    def calibrate(self) -> None:
        pass

    def configure(self) -> None:
        pass

    def get_observation(self) -> dict:
        obs = {f"{m}.pos": float(p) for m, p in zip(self.motors, self._pos)}
        for c in self.cameras:
            obs[c] = self._rng.integers(0, 256, (self.config.height, self.config.width, 3), dtype=np.uint8)
        if self.config.log_dir:
            path = os.path.join(self.config.log_dir, f"obs_{self._n_obs:06d}.npz")
            np.savez(path, state=np.array([obs[f"{m}.pos"] for m in self.motors]),
                     **{f"cam/{c}": obs[c] for c in self.cameras})
        self._n_obs += 1
        self._pos[self.n_actions:] += 1.0  # unactuated joints drift: no two states within 1 (lerobot's similarity filter)
        return obs

    def send_action(self, action: dict) -> dict:
        for i, m in enumerate(self.motors[: self.n_actions]):
            self._pos[i] = float(action[f"{m}.pos"])
        if self._log:
            self._log.write(json.dumps({"step": self._n_act, "action": [action[f"{m}.pos"] for m in self.motors[: self.n_actions]]}) + "\n")
        self._n_act += 1
        return action

    def disconnect(self) -> None:
        if self._log:
            self._log.close()
            self._log = None
        self._connected = False
