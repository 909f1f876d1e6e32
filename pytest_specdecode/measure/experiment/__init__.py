"""The experiment: the design's server starts, measured in order on demand.

- arms.py: `Experiment`, each arm's starts and phases (side by side: `_start_group`);
- rounds.py: a start's requests in rounds of slots, to one start or several in turn;
- windows.py: a window's requests sent (`WindowSender.send`), summed up, the adaptive stop;
- watch.py: other clients and other work, judged and waited out (`QuietWatch`);
- token_record.py: each prompt's token ids after a start, for the n-gram replay;
- order.py: the interleaved order of rounds and slots (pure); context.py: what they share.
"""
