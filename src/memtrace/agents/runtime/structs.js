/*
 * Reading and writing the C structs layout.js describes ({name, size, fields: {field: [offset,
 * type]}}, type one of U8 U16 U32 S32 U64 S64), so no offset is written by hand.
 */

/* Writes every field of `layout` at `p` from `values` (numbers, UInt64 or Int64); a field
 * missing from `values`, or a value for a field the layout lacks, is a bug and throws. */
export function writeStruct(p, layout, values) {
  for (const name of Object.keys(values)) {
    if (!(name in layout.fields))
      throw new Error(`${layout.name} has no field ${name}`);
  }
  for (const [name, [offset, type]] of Object.entries(layout.fields)) {
    if (!(name in values))
      throw new Error(`${layout.name}.${name}: no value`);
    p.add(offset)['write' + type](values[name]);
  }
}

export function writeField(p, layout, name, value) {
  const [offset, type] = layout.fields[name];
  p.add(offset)['write' + type](value);
}

/* Every field as read: a number, or a UInt64/Int64 for the 64-bit types. */
export function readStruct(p, layout) {
  const out = {};
  for (const [name, [offset, type]] of Object.entries(layout.fields))
    out[name] = p.add(offset)['read' + type]();
  return out;
}
