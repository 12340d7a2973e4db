"""The MicroDuck biped: one env, tasks as data, rewards as registered terms."""

from waddle.envs.microduck.env import MicroDuckEnv
from waddle.envs.microduck.randomization import MicroDuckRandomization
from waddle.envs.microduck.rewards import REWARD_PARAMS, REWARD_TERMS, register_reward
from waddle.envs.microduck.sampler import MicroDuckTaskSampler
from waddle.envs.microduck.sensors import SENSOR_FIELDS, SensorField
from waddle.envs.microduck.tasks import MicroDuckTask

__all__ = [
    "REWARD_PARAMS",
    "REWARD_TERMS",
    "SENSOR_FIELDS",
    "MicroDuckEnv",
    "MicroDuckRandomization",
    "MicroDuckTask",
    "MicroDuckTaskSampler",
    "SensorField",
    "register_reward",
]
