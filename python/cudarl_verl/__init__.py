"""cudarl-pipe's side of a VERL run: the reward function that scores rollouts through
`cudarl-pipe serve` (see reward.py). The curriculum comes from
`cudarl-pipe export curriculum --format verl` (RL files; `export rl-train --format verl` adds the
SFT files)."""
