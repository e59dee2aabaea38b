package jobspec

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

// Every field of Spec but those sameIgnores names makes two specs differ:
// a field added to Spec is compared by Same unless someone decides, in
// sameIgnores, that it is not part of the contract.
func TestSameCountsEveryField(t *testing.T) {
	base := Spec{JobID: "j", Namespace: "ns", Model: "m", Throughput: map[string]float64{"v100": 1}, Steps: 10, Workers: 1,
		Weight: 1, Sensitivity: 1, MinRunTime: time.Minute, Queue: "q", Priority: 50, Group: "g", Task: "t",
		Device: "nvidia/gpu", DeviceModel: "", Gates: []Gate{{}}}
	typ := reflect.TypeOf(base)
	for i := range typ.NumField() {
		f := typ.Field(i)
		changed := base
		changed.Throughput = map[string]float64{"v100": 1}
		v := reflect.ValueOf(&changed).Elem().Field(i)
		if !bump(v) {
			t.Fatalf("field %s of kind %s: teach bump to change it", f.Name, f.Type.Kind())
		}
		ignored := slices.Contains(sameIgnores, f.Name)
		if base.Same(changed) != ignored {
			t.Errorf("field %s changed: Same = %v, want %v (add it to sameIgnores only if it is not part of what a job asks)", f.Name, !ignored, ignored)
		}
	}
	for _, name := range sameIgnores {
		if _, ok := typ.FieldByName(name); !ok {
			t.Errorf("sameIgnores names %s, not a field of Spec", name)
		}
	}
}

// bump changes v to a different value of its type.
func bump(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Float64:
		v.SetFloat(v.Float() + 1)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k := reflect.New(v.Type().Key()).Elem()
		bump(k)
		m.SetMapIndex(k, reflect.New(v.Type().Elem()).Elem())
		v.Set(m)
	case reflect.Slice:
		v.Set(reflect.Append(v, reflect.New(v.Type().Elem()).Elem()))
	default:
		return false
	}
	return true
}
