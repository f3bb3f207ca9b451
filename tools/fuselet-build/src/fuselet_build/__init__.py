"""fuselet-build: render, build, verify and seed fuselet's conda packages.

A thin orchestrator over py-rattler-build (render, build, test) and py-rattler (solve,
install, index): it never re-implements what those libraries do.
"""
