"""A workaround, kept in this one place: py-rattler-build 0.73 resolves a variant's
`pin_subpackage(<name>, exact=True)` against EVERY rendered sibling output of that name, not
against the one the variant was rendered with. Built that way, a CUDA fuselet-torch was pinned
to the CPU libfuselet (verify caught it).

`build.build` narrows each rendered variant's siblings with `pinned_siblings` before it runs
the build. Remove this module once rattler-build pins to the rendered variant's own sibling
(the e2e test `test_verify_passes` checks the pins of every built package).
"""

from __future__ import annotations

from fuselet_build import matrix


def pinned_siblings(rendered) -> list:
    """The sibling outputs rattler-build may use to resolve this variant's pin_subpackage:
    every sibling once, and of libfuselet only the one this variant was rendered against (its
    `libfuselet` variant key)."""
    want = rendered.variant.get("libfuselet")
    keep, seen = [], set()
    for s in rendered._siblings:
        job = matrix.job_of(s)
        if job.name == "libfuselet" and want and f"{job.version} {job.build_string}" != want:
            continue
        if job.key not in seen:
            seen.add(job.key)
            keep.append(s)
    return keep
