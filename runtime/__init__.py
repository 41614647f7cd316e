"""The runtime imported by generated programs. It imports torch and itself only, never the compiler."""
