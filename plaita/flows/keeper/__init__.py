"""The keeper: deadlines, orphans and schedules, one acting keeper per queue."""
