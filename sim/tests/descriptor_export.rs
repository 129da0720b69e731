//! `jitmap-sim` is a host that readers in other processes are pointed at
//! (`spin`, `profile`): its executable exports the descriptor dynamically.

const SIM: &str = env!("CARGO_BIN_EXE_jitmap-sim");

#[test]
fn the_executable_exports_the_descriptor_dynamically() {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(SIM).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let symbol = elf
        .dynamic_symbols()
        .find(|s| s.name() == Ok("jitmap_descriptor"))
        .expect("jitmap_descriptor in .dynsym");
    assert_eq!(
        symbol.size(),
        size_of::<jitmap::remote::Descriptor>() as u64
    );
}
