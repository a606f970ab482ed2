// Command lincheck checks a FAWN client history (JSON lines, see package history) for
// per-key linearizability with Porcupine.
//
//	lincheck [-viz out.html] [-timeout 60s] history.jsonl
//
// Exit status: 0 linearizable, 1 not linearizable (the offending keys are printed and, with
// -viz, Porcupine's visualization of them is written), 2 undecided (the check ran out of time)
// or bad input.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fawn/tools/linearizability/history"
)

func main() {
	viz := flag.String("viz", "", "when not linearizable, write Porcupine's HTML visualization of the illegal keys here")
	timeout := flag.Duration("timeout", 60*time.Second, "time budget per key (0 = unlimited)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: lincheck [-viz out.html] [-timeout 60s] history.jsonl\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	os.Exit(run(flag.Arg(0), *viz, *timeout))
}

func run(path, viz string, timeout time.Duration) int {
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lincheck: %v\n", err)
		return 2
	}
	records, err := history.Parse(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "lincheck: %s: %v\n", path, err)
		return 2
	}
	rep := history.Check(records, timeout)
	for _, w := range rep.Warnings {
		fmt.Printf("warning: %s\n", w)
	}
	illegal := rep.Illegal()
	timedOut := rep.TimedOut()
	fmt.Printf("lincheck: %d operations (%d of unknown outcome) on %d keys\n", rep.Operations, rep.Unknown, len(rep.Keys))
	if viz != "" && len(illegal) > 0 {
		if err := history.Visualize(records, illegal, viz, timeout); err != nil {
			fmt.Fprintf(os.Stderr, "lincheck: visualization: %v\n", err)
		} else {
			fmt.Printf("visualization: %s\n", viz)
		}
	}
	switch {
	case len(illegal) > 0:
		for _, k := range illegal {
			fmt.Printf("NOT LINEARIZABLE: key %q\n", k)
		}
		return 1
	case len(timedOut) > 0:
		fmt.Printf("UNDECIDED (timed out after %v) on keys: %s\n", timeout, strings.Join(timedOut, ", "))
		return 2
	default:
		fmt.Println("linearizable")
		return 0
	}
}
