"""``python -m fuselet``: print what this fuselet was built against and what is available."""

from fuselet._info import info

info()
