// Package cli is the relay command line: it parses flags and RELAY_*
// environment variables, and calls the packages that do the work.
//
// The relay binary (cmd/relay) is [Main]. The development binary
// (cmd/relay-dev) is [MainWith] the relay's commands and its own (demo and
// bench, in internal/devcli), so that the test harness they need (a
// throwaway PostgreSQL, Docker through testcontainers) stays out of the
// production binary.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// IO is what a command may touch of its surroundings.
type IO struct {
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads the environment; tests pass their own.
	Getenv func(string) string
	// describe, when set, receives a command's FlagSet in place of
	// parsing it, and the command returns flag.ErrHelp: how [Reference]
	// lists flags without running anything.
	describe func(*flag.FlagSet)
}

// Command is a command another binary adds to the relay's own.
type Command struct {
	Name    string
	Summary string
	// Run executes the command with its arguments; errors from [Usagef]
	// and [Parse] exit 2, others 1.
	Run func(ctx context.Context, stdio IO, args []string) error
	// Subcommands name the subcommands Run dispatches on its first
	// argument, each with its summary, for [Reference].
	Subcommands []Command
}

type command struct {
	name    string
	summary string
	// run executes the command; nil when the command only groups others.
	run func(ctx context.Context, io IO, args []string) error
	sub []*command
	// readOnly commands only read files, databases and listeners: a panic
	// in one is reported in one line (see runGuarded) instead of a Go
	// stack trace.
	readOnly bool
}

// group is a command that only groups the subcommands given.
func group(name, summary string, sub ...*command) *command {
	return &command{name: name, summary: summary, sub: sub}
}

// usageError is a mistake on the command line: it prints usage and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// Usagef is a mistake on the command line, for a [Command]: it prints the
// message and exits 2.
func Usagef(format string, args ...any) error { return usagef(format, args...) }

func commands(name string, extra []Command) *command {
	root := &command{
		name: name,
		sub: []*command{
			migrateCommand(),
			runCommand(),
			logCommand(),
			replayCommand(),
			deadLettersCommand(),
			statusCommand(),
			topicsCommand(),
			groupsCommand(),
			listenerUsersCommand(),
			schemaCommand(),
			tableCommand(),
			versionCommand(name),
			doctorCommand(),
			healthcheckCommand(),
		},
	}
	for _, c := range extra {
		root.sub = append(root.sub, &command{name: c.Name, summary: c.Summary, run: c.Run})
	}
	return root
}

// devOnly are the commands of relay-dev (cmd/relay-dev) that the daemon's
// binary leaves out with the test harness they bring; asked of the daemon,
// they get a pointer to relay-dev instead of "unknown command".
var devOnly = map[string]bool{"demo": true, "bench": true}

// Main runs the command line args (without the program name) and returns
// the process exit status: 0 on success, 1 on failure, 2 on bad usage.
func Main(args []string, stdio IO) int {
	return MainWith("relay", nil, args, stdio)
}

// MainWith is [Main] for the binary called name, which has the relay's
// commands and extra.
func MainWith(name string, extra []Command, args []string, stdio IO) int {
	if stdio.Getenv == nil {
		stdio.Getenv = os.Getenv
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(args) > 0 && isVersionFlag(args[0]) {
		args = append([]string{"version"}, args[1:]...)
	}
	return dispatch(ctx, name, commands(name, extra), args, stdio)
}

// dispatch runs the command of root that args name.
func dispatch(ctx context.Context, name string, root *command, args []string, stdio IO) int {
	cmd, rest, path := resolve(root, args)
	if cmd.run == nil {
		switch {
		case len(rest) == 0:
			printUsage(stdio.Stderr, cmd, path)
			return 2
		case rest[0] == "-h" || rest[0] == "--help" || rest[0] == "help":
			printUsage(stdio.Stdout, cmd, path)
			return 0
		case len(path) == 1 && devOnly[rest[0]]:
			fmt.Fprintf(stdio.Stderr, "%s: %q is a command of the development binary, not of the daemon: run go run ./cmd/relay-dev %s\n",
				name, rest[0], strings.Join(rest, " "))
			return 2
		default:
			fmt.Fprintf(stdio.Stderr, "%s: unknown command %q\n\n", name, strings.Join(append(path, rest[0]), " "))
			printUsage(stdio.Stderr, cmd, path)
			return 2
		}
	}
	err := runGuarded(ctx, cmd, path, stdio, rest)
	var usage *usageError
	var internal *internalError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &internal):
		fmt.Fprintf(stdio.Stderr, "%s: internal error in %s: %s (please report)\n", name, strings.Join(path[1:], " "), oneLine(internal.msg))
		return 1
	case errors.As(err, &usage):
		fmt.Fprintf(stdio.Stderr, "%s: %s\n", strings.Join(path, " "), usage.msg)
		return 2
	default:
		fmt.Fprintf(stdio.Stderr, "%s: %s\n", strings.Join(path, " "), oneLine(err.Error()))
		return 1
	}
}

// internalError is a panic in a read-only command, turned into an error.
type internalError struct{ msg string }

func (e *internalError) Error() string { return e.msg }

// runGuarded runs cmd. A panic in a read-only command's goroutine becomes
// an internalError, printed as one line: those commands read files and
// databases a user may point anywhere, and a stack trace is no answer to
// bad input. The guard is the last line, not the fix: the tests of the
// read-only commands fail on this line as on a panic. Other commands
// (the daemon above all) keep Go's report of a panic whole.
func runGuarded(ctx context.Context, cmd *command, path []string, stdio IO, args []string) (err error) {
	if cmd.readOnly {
		defer func() {
			if v := recover(); v != nil {
				err = &internalError{msg: fmt.Sprint(v)}
			}
		}()
	}
	return cmd.run(ctx, stdio, args)
}

func resolve(root *command, args []string) (*command, []string, []string) {
	cmd, path := root, []string{root.name}
	for len(args) > 0 {
		next := find(cmd.sub, args[0])
		if next == nil {
			break
		}
		cmd, path, args = next, append(path, next.name), args[1:]
	}
	return cmd, args, path
}

func find(cmds []*command, name string) *command {
	for _, c := range cmds {
		if c.name == name {
			return c
		}
	}
	return nil
}

func printUsage(w io.Writer, cmd *command, path []string) {
	fmt.Fprintf(w, "Usage: %s <command> [flags]\n\nCommands:\n", strings.Join(path, " "))
	for _, c := range cmd.sub {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun '%s <command> -h' for a command's flags.\n", strings.Join(path, " "))
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// flagSet returns a FlagSet that reports errors instead of exiting.
func flagSet(name string, stdio IO) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stdio.Stderr)
	return fs
}

// FlagSet is the FlagSet of a [Command]: it reports errors instead of
// exiting. Parse it with [Parse].
func FlagSet(name string, stdio IO) *flag.FlagSet { return flagSet(name, stdio) }

// Parse parses a [Command]'s flags as the relay's own: a flag not on the
// command line takes its RELAY_* environment variable, and positional
// arguments are refused.
func Parse(fs *flag.FlagSet, args []string, stdio IO) error {
	return parse(fs, args, stdio, false)
}

// EnvName is the environment variable that sets a flag: RELAY_ and the flag
// name in upper case with dashes as underscores.
func EnvName(flagName string) string {
	return "RELAY_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parse parses args; every flag not given on the command line takes its
// RELAY_* environment variable when that is set. Positional arguments are
// refused unless allowed.
func parse(fs *flag.FlagSet, args []string, stdio IO, positional bool) error {
	if stdio.describe != nil {
		stdio.describe(fs)
		return flag.ErrHelp
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of %s (every flag may also be set as RELAY_<FLAG>, e.g. %s):\n", fs.Name(), EnvName("database-url"))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{msg: err.Error()}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	sort.Strings(names)
	for _, name := range names {
		if set[name] {
			continue
		}
		if v := stdio.Getenv(EnvName(name)); v != "" {
			if err := fs.Set(name, v); err != nil {
				return usagef("invalid %s: %v", EnvName(name), err)
			}
		}
	}
	if !positional && fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}
