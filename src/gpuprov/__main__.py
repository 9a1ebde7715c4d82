from gpuprov.cli import run

run()
