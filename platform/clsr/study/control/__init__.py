"""The line between the study command (the supervisor) and its driver process, and how the driver handles interrupts."""
