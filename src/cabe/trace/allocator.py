def replay_reserved(sizes, events, expandable_segments=False):
    return 0
