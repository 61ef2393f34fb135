"""What a cluster delivers: seconds per update, episodes and dollars an hour, hours and dollars to a win
and from `make up` to `make down`, on demand and with spot workers (--spot-usd-per-node-hour,
--interruptions-per-node-hour), and which of a few sizes (--sizes) gets there cheapest and fastest.

    make plan NODES=11 CPUS=18 BATCH=300      # = python -m pongtools.plan project --nodes 11 ...
    make plan-inputs RUN=<run dir>            # = python -m pongtools.plan inputs --run <run dir>

No Ray is needed to plan. One idea per module:

- model.py: an update simulated as the trainer runs it, over the stages of learning;
- inputs.py: the model's measured inputs (plan_inputs.json), rebuilt from a run's metrics
  and from a calibration;
- milestones.py: the updates each seed's run needed to each milestone of learning;
- endtoend.py: from `make up` to `make down`, building the image on each node or pulling it,
  the bring-up's parts in the launcher's order (their seconds in end_to_end_inputs.json,
  each measured, sourced, assumed or projected from figures that are), the
  training, `ray down`, and what the nodes bill meanwhile;
- calibration.py: measuring here what the inputs need (Ray and the emulator, minutes);
- output.py: the projection as key=value lines, and the prices it counts.

__main__.py is the command line: `python -m pongtools.plan {project,inputs,calibrate,probe}`. A mistake
found anywhere in it is pgpong.cli's UserError: one line, exit 2.
"""
