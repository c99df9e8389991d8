"""The implementation contract: the operations and dtypes the suite declares (from CONTRACT §4), how an implementation declares its capabilities, and how one is loaded from a spec."""
