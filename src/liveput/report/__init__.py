"""Reports: the HTML page and PNG figures of a simulation."""

from liveput.report.html import SUMMARY_HEADER, summary_rows, write_report
from liveput.report.plots import FIGURES, write_figures

__all__ = ["FIGURES", "SUMMARY_HEADER", "summary_rows", "write_figures", "write_report"]
