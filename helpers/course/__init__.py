"""The course's tooling: doctor, install, reproduce, notebooks, workshop (run behind make targets)."""
