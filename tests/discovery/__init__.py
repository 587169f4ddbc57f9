"""Publishers and subscribers: containers, views, wire formats, faults and stale lists."""
