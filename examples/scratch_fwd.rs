use specdec::*;
fn main() -> anyhow::Result<()> {
    let path = std::path::PathBuf::from("models-cache/SmolLM2-135M-Instruct.Q4_1.gguf");
    let fmts: Vec<String> = std::env::args().skip(1).collect();
    for fmt in fmts {
        let (w, _) = ModelFiles::Gguf(path.clone()).load(fmt.parse()?, &candle_core::Device::Cpu)?;
        let mut m = Llama::new(w.clone())?;
        m.forward(&(0..100).collect::<Vec<u32>>(), 0)?;
        let mut base = 0.0;
        for rows in [1usize, 2, 3, 5, 7] {
            let toks: Vec<u32> = (100..100 + rows as u32).collect();
            let n = 20;
            let mut best = f64::MAX;
            for _ in 0..3 {
                let t = std::time::Instant::now();
                for _ in 0..n { m.forward(&toks, rows)?; m.truncate(100)?; }
                best = best.min(t.elapsed().as_secs_f64() * 1000.0 / n as f64);
            }
            if rows == 1 { base = best; }
            println!("{fmt} {:?} rows {rows}: {best:.2} ms  v={:.2}", w.engine(), best / base);
        }
    }
    Ok(())
}
