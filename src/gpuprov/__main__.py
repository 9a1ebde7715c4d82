from gpuprov.cli import main

main()
