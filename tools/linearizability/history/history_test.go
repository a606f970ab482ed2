package history

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
)

func mustParse(t *testing.T, text string) []Record {
	t.Helper()
	recs, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return recs
}

func verdict(t *testing.T, text string) Report {
	t.Helper()
	return Check(mustParse(t, text), 0)
}

const linearizable = `
{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":10}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":11,"return":20}
{"client":0,"op":"put","key":"a","value":"a2","output":null,"ok":true,"call":21,"return":40}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":22,"return":30}
{"client":2,"op":"get","key":"a","value":null,"output":"a2","ok":true,"call":25,"return":35}
{"client":1,"op":"delete","key":"a","value":null,"output":"deleted","ok":true,"call":41,"return":50}
{"client":2,"op":"get","key":"a","value":null,"output":null,"ok":true,"call":51,"return":60}
{"client":2,"op":"delete","key":"a","value":null,"output":"not_found","ok":true,"call":61,"return":70}
{"client":0,"op":"get","key":"b","value":null,"output":null,"ok":true,"call":0,"return":5}
{"client":0,"op":"put","key":"b","value":"b1","output":null,"ok":true,"call":6,"return":9}
{"client":1,"op":"get","key":"b","value":null,"output":"b1","ok":true,"call":7,"return":8}
`

func TestLinearizableHistoryPasses(t *testing.T) {
	rep := verdict(t, linearizable)
	if len(rep.Illegal()) != 0 || len(rep.TimedOut()) != 0 {
		t.Fatalf("expected linearizable, got %+v", rep)
	}
	if len(rep.Keys) != 2 || rep.Operations != 11 {
		t.Fatalf("expected 2 keys and 11 operations, got %+v", rep)
	}
}

// A read that returns a value overwritten before the read began.
func TestStaleReadFails(t *testing.T) {
	rep := verdict(t, `
{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":10}
{"client":0,"op":"put","key":"a","value":"a2","output":null,"ok":true,"call":11,"return":20}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":21,"return":30}
{"client":0,"op":"put","key":"b","value":"b1","output":null,"ok":true,"call":0,"return":10}
`)
	if got := rep.Illegal(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("expected key a illegal, got %+v", rep)
	}
}

// A read that sees a deleted key's old value.
func TestReadAfterDeleteFails(t *testing.T) {
	rep := verdict(t, `
{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":10}
{"client":0,"op":"delete","key":"a","value":null,"output":"deleted","ok":true,"call":11,"return":20}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":21,"return":30}
`)
	if len(rep.Illegal()) != 1 {
		t.Fatalf("expected illegal, got %+v", rep)
	}
}

// Two readers see two writes in opposite orders: not linearizable although each read alone
// is fresh enough.
func TestNonMonotonicReadsFail(t *testing.T) {
	rep := verdict(t, `
{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":100}
{"client":1,"op":"put","key":"a","value":"a2","output":null,"ok":true,"call":0,"return":100}
{"client":2,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":10,"return":20}
{"client":2,"op":"get","key":"a","value":null,"output":"a2","ok":true,"call":30,"return":40}
{"client":3,"op":"get","key":"a","value":null,"output":"a2","ok":true,"call":10,"return":20}
{"client":3,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":30,"return":40}
`)
	if len(rep.Illegal()) != 1 {
		t.Fatalf("expected illegal, got %+v", rep)
	}
}

// A delete that claims the key existed when it cannot have.
func TestDeleteResultIsChecked(t *testing.T) {
	rep := verdict(t, `
{"client":0,"op":"delete","key":"a","value":null,"output":"deleted","ok":true,"call":0,"return":10}
`)
	if len(rep.Illegal()) != 1 {
		t.Fatalf("expected illegal, got %+v", rep)
	}
}

// An unknown put that took effect: a later read sees it, long after the put "returned".
func TestUnknownPutThatTookEffect(t *testing.T) {
	rep := verdict(t, `
{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":10}
{"client":0,"op":"put","key":"a","value":"a2","output":null,"ok":"unknown","call":11,"return":20}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":21,"return":30}
{"client":1,"op":"get","key":"a","value":null,"output":"a2","ok":true,"call":1000,"return":1010}
`)
	if len(rep.Illegal()) != 0 || rep.Unknown != 1 {
		t.Fatalf("expected linearizable with one unknown, got %+v", rep)
	}
}

// An unknown put that never took effect: no read ever sees it.
func TestUnknownPutThatDidNotTakeEffect(t *testing.T) {
	rep := verdict(t, `
{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":10}
{"client":0,"op":"put","key":"a","value":"a2","output":null,"ok":"unknown","call":11,"return":20}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":21,"return":30}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":1000,"return":1010}
`)
	if len(rep.Illegal()) != 0 {
		t.Fatalf("expected linearizable, got %+v", rep)
	}
}

// An unknown put cannot take effect before it was called, nor un-happen once seen.
func TestUnknownPutIsStillConstrained(t *testing.T) {
	before := verdict(t, `
{"client":1,"op":"get","key":"a","value":null,"output":"a2","ok":true,"call":0,"return":5}
{"client":0,"op":"put","key":"a","value":"a2","output":null,"ok":"unknown","call":11,"return":20}
`)
	if len(before.Illegal()) != 1 {
		t.Fatalf("a read before the unknown put's call cannot see it: %+v", before)
	}
	flipflop := verdict(t, `
{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":10}
{"client":0,"op":"put","key":"a","value":"a2","output":null,"ok":"unknown","call":11,"return":20}
{"client":1,"op":"get","key":"a","value":null,"output":"a2","ok":true,"call":21,"return":30}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":31,"return":40}
`)
	if len(flipflop.Illegal()) != 1 {
		t.Fatalf("a seen unknown put cannot be undone: %+v", flipflop)
	}
}

// Failed operations (ok=false) and gets of unknown outcome are dropped.
func TestFailedAndUnknownGetsAreDropped(t *testing.T) {
	rep := verdict(t, `
{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":false,"call":0,"return":10}
{"client":1,"op":"get","key":"a","value":null,"output":"zz","ok":"unknown","call":21,"return":30}
{"client":1,"op":"get","key":"a","value":null,"output":null,"ok":true,"call":31,"return":40}
`)
	if len(rep.Illegal()) != 0 || rep.Operations != 1 {
		t.Fatalf("expected one checked operation, linearizable: %+v", rep)
	}
}

func TestDuplicatePutValuesWarn(t *testing.T) {
	rep := verdict(t, `
{"client":0,"op":"put","key":"a","value":"x","output":null,"ok":true,"call":0,"return":10}
{"client":1,"op":"put","key":"a","value":"x","output":null,"ok":true,"call":11,"return":20}
`)
	if len(rep.Warnings) != 1 {
		t.Fatalf("expected a warning: %+v", rep)
	}
}

func TestBadInputIsRejected(t *testing.T) {
	for _, line := range []string{
		`{"client":0,"op":"cas","key":"a","value":"x","output":null,"ok":true,"call":0,"return":1}`,
		`{"client":0,"op":"put","key":"a","value":null,"output":null,"ok":true,"call":0,"return":1}`,
		`{"client":0,"op":"get","key":"a","value":null,"output":null,"ok":"maybe","call":0,"return":1}`,
		`{"client":0,"op":"get","key":"a","value":null,"output":null,"ok":true,"call":5,"return":1}`,
		`not json`,
	} {
		if _, err := Parse(strings.NewReader(line)); err == nil {
			t.Errorf("accepted %s", line)
		}
	}
}

// The partitioned model used as a whole (Porcupine's own partitioning, operations and
// events) gives the same verdicts as the per-key check.
func TestPorcupinePartitionedModel(t *testing.T) {
	ops := Operations(mustParse(t, linearizable))
	if !porcupine.CheckOperations(Model, ops) {
		t.Fatal("operations: expected linearizable")
	}
	// The same history as call/return events in time order (a call before a return at
	// the same instant: Porcupine's intervals are closed).
	type stamped struct {
		t  int64
		ev porcupine.Event
	}
	var all []stamped
	for i, op := range ops {
		all = append(all, stamped{op.Call, porcupine.Event{ClientId: op.ClientId, Kind: porcupine.CallEvent, Value: op.Input, Id: i}})
		all = append(all, stamped{op.Return, porcupine.Event{ClientId: op.ClientId, Kind: porcupine.ReturnEvent, Value: op.Output, Id: i}})
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].t != all[j].t {
			return all[i].t < all[j].t
		}
		return all[i].ev.Kind == porcupine.CallEvent && all[j].ev.Kind == porcupine.ReturnEvent
	})
	var hist []porcupine.Event
	for _, s := range all {
		hist = append(hist, s.ev)
	}
	if !porcupine.CheckEvents(Model, hist) {
		t.Fatal("events: expected linearizable")
	}
}

func TestVisualizationIsWritten(t *testing.T) {
	recs := mustParse(t, `
{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":10}
{"client":0,"op":"put","key":"a","value":"a2","output":null,"ok":true,"call":11,"return":20}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":21,"return":30}
`)
	path := filepath.Join(t.TempDir(), "viz.html")
	if err := Visualize(recs, []string{"a"}, path, 0); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), "<html") {
		t.Fatalf("no visualization: %v", err)
	}
}

const casBase = `
{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":10}
`

// A cas that read a1 succeeds while a1 is current; one that read an older value fails.
func TestCasResultsAreChecked(t *testing.T) {
	ok := verdict(t, casBase+`
{"client":1,"op":"cas","key":"a","value":"a2","expect":"a1","output":"stored","ok":true,"call":11,"return":20}
{"client":2,"op":"cas","key":"a","value":"a3","expect":"a1","output":"exists","ok":true,"call":21,"return":30}
{"client":2,"op":"get","key":"a","value":null,"output":"a2","ok":true,"call":31,"return":40}
{"client":2,"op":"delete","key":"a","value":null,"output":"deleted","ok":true,"call":41,"return":50}
{"client":2,"op":"cas","key":"a","value":"a4","expect":"a2","output":"not_found","ok":true,"call":51,"return":60}
`)
	if len(ok.Illegal()) != 0 {
		t.Fatalf("expected linearizable, got %+v", ok)
	}
	for name, text := range map[string]string{
		"stored on a stale expectation": `
{"client":0,"op":"put","key":"a","value":"a2","output":null,"ok":true,"call":11,"return":20}
{"client":1,"op":"cas","key":"a","value":"a3","expect":"a1","output":"stored","ok":true,"call":21,"return":30}
`,
		"exists on a current expectation": `
{"client":1,"op":"cas","key":"a","value":"a3","expect":"a1","output":"exists","ok":true,"call":21,"return":30}
`,
		"the stored value is not read back": `
{"client":1,"op":"cas","key":"a","value":"a3","expect":"a1","output":"stored","ok":true,"call":21,"return":30}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":31,"return":40}
`,
	} {
		rep := verdict(t, casBase+text)
		if got := rep.Illegal(); len(got) != 1 {
			t.Errorf("%s: expected key a illegal, got %+v", name, rep)
		}
	}
}

// A cas of unknown outcome may or may not have written.
func TestUnknownCas(t *testing.T) {
	rep := verdict(t, casBase+`
{"client":1,"op":"cas","key":"a","value":"a2","expect":"a1","output":null,"ok":"unknown","call":11,"return":20}
{"client":2,"op":"get","key":"a","value":null,"output":"a2","ok":true,"call":31,"return":40}
`)
	if len(rep.Illegal()) != 0 {
		t.Fatalf("expected linearizable, got %+v", rep)
	}
}
