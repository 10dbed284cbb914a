// Command relay is the transactional outbox relay daemon. See README.md and docs/
package main

import (
	"os"

	"github.com/outboxrelay/relay/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], cli.IO{Stdout: os.Stdout, Stderr: os.Stderr}))
}
