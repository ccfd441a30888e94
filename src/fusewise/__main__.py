from fusewise.cli import run

run()
