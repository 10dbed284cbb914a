// Package leakcheck is the goroutine-leak check of the test binaries of
// the packages that start goroutines (relay, cdc, poller, the broker, its
// Kafka protocol server and the two sinks). It runs in TestMain after
// m.Run and after the package's PostgreSQL is stopped (pgtest.Run), so
// that what the tests and their fixtures opened has been closed: a
// goroutine still running then is a leak, in the tests or in the code
// they ran. goleak.VerifyTestMain cannot be used because pgtest.Main
// exits itself.
package leakcheck

import (
	"fmt"
	"os"

	"go.uber.org/goleak"
)

// ignored are background goroutines of libraries that live for the whole
// process by design, each with why.
var ignored = []goleak.Option{
	// The standard library's signal watcher: started by the first
	// signal.Notify (the tests of a stop on SIGTERM) and never ended.
	goleak.IgnoreTopFunction("os/signal.signal_recv"),
	goleak.IgnoreTopFunction("os/signal.loop"),
}

// Exit is os.Exit(code) after the leak check: when the tests passed and
// a goroutine is left over, it prints them and exits 1. extra ignores
// more, each to be commented at its call.
func Exit(code int, extra ...goleak.Option) {
	if code == 0 {
		if err := goleak.Find(append(append([]goleak.Option{}, ignored...), extra...)...); err != nil {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines left running after the tests:\n%v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
