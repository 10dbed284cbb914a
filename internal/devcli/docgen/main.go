// Command docgen regenerates docs/reference.md and the generated section of
// docs/kafka-compatibility.md from the code. Run it from the repository's
// root: go run ./internal/devcli/docgen
package main

import (
	"fmt"
	"os"

	"github.com/outboxrelay/relay/internal/docgen"
)

func main() {
	if _, err := os.Stat("go.mod"); err != nil {
		fmt.Fprintln(os.Stderr, "docgen: run it from the repository's root: "+docgen.Command)
		os.Exit(2)
	}
	if err := docgen.Write("."); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
}
